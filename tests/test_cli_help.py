"""Help texts: every command, option and argument is described, and the defaults they name are the ones used."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from mcsim.cli import main

COMMANDS = sorted(main.commands.items())


def test_every_command_has_a_help_text():
    for name, command in COMMANDS:
        assert (command.help or "").strip(), name


@pytest.mark.parametrize("name, command", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_option_and_argument_is_described(name, command):
    ctx = click.Context(command, info_name=name, parent=click.Context(main, info_name="mcsim"))
    helptext = command.get_help(ctx)
    for param in command.params:
        if isinstance(param, click.Option):
            assert (param.help or "").strip(), f"mcsim {name} {param.opts[0]} has no help text"
        else:  # click arguments take no help of their own: the command's text must name each one
            assert param.human_readable_name.upper() in (command.help or ""), \
                f"mcsim {name}: the help does not explain {param.human_readable_name.upper()}"
    assert "--help" in helptext


def test_the_group_options_are_described():
    for param in main.params:
        assert (param.help or "").strip(), param.opts


@pytest.mark.parametrize("command, default", [
    ("run", "outputs/<name>.nc"), ("compare", "outputs/<name>-compare.nc"), ("sweep", "outputs/<name>-sweep.nc")])
def test_the_output_help_names_the_file_the_command_writes(command, default):
    text = CliRunner().invoke(main, [command, "--help"], terminal_width=200).output
    assert f"(default: {default}" in " ".join(text.split())
