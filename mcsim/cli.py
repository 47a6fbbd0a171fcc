"""The ``mcsim`` command line: a thin layer over :mod:`mcsim.runner`.

Bad input (scenario, trace, override, existing output) is one or two lines on stderr and exit code 2; no
traceback, and no output file is left behind.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import click

EXIT_USAGE = 2


class UserError(click.ClickException):
    exit_code = EXIT_USAGE

    def show(self, file=None):
        click.echo(f"error: {self.format_message()}", err=True)


def _common(f):
    options = [
        click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--samples", type=click.IntRange(min=1), help="Monte Carlo samples (default: [mc] samples)."),
        click.option("--requests", type=click.IntRange(min=1), help="Requests per sample (default: [mc] requests)."),
        click.option("--seed", type=click.IntRange(min=0), help="Root seed (default: [mc] seed)."),
        click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
                     help="Override a scenario value, e.g. --set speculative.draft_tokens=2 (repeatable)."),
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
                     help="NetCDF file to write (default: outputs/<name>.nc)."),
        click.option("--force", is_flag=True, help="Overwrite an existing output file."),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
        click.option("--workers", type=click.IntRange(min=1), help="Dask threads (default: all cores)."),
        click.option("--no-progress", is_flag=True, help="Hide the progress bar."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mcsim")
def main():
    """mcsim: Monte Carlo economics of serving large language models.

    All figures it prints are modelled from the scenario's assumptions, not measured.
    """


def _finite(obj):
    """Strict JSON: a non-finite number (an infinite payback, an empty band) becomes null."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _command_line() -> str:
    """The command as parsed (not ``sys.argv``, which is the host's when called from Python)."""
    ctx = click.get_current_context()
    words = ["mcsim", ctx.info_name]
    for name, value in ctx.params.items():
        if name == "scenario":
            words.insert(2, shlex.quote(str(value)))
        elif value in (None, False, ()):
            continue
        elif value is True:
            words.append(f"--{name.replace('_', '-')}" if name != "as_json" else "--json")
        elif name == "overrides":
            words += [f"--set {shlex.quote(v)}" for v in value]
        else:
            words.append(f"--{name.replace('_', '-')} {shlex.quote(str(value))}")
    return " ".join(words)


def _execute(kind, scenario, samples, requests, seed, overrides, output, force, as_json, workers, no_progress):
    from mcsim import runner, summary
    from mcsim.distributions import DistributionError
    from mcsim.scenario import ScenarioError, load_scenario

    try:
        scn = load_scenario(scenario, overrides=overrides)
        output = output or Path("outputs") / f"{scn.name}{'-compare' if kind == 'compare' else ''}.nc"
        if output.exists() and not force:
            raise UserError(f"{output} exists; use --force to overwrite it or -o to choose another file")
        fn = runner.compare if kind == "compare" else runner.run
        ds = fn(scn, samples=samples, requests=requests, seed=seed, workers=workers,
                progress=not no_progress and not as_json, command=_command_line())
    except (ScenarioError, DistributionError) as err:
        raise UserError(str(err)) from None
    except Exception as err:  # trace readers raise TraceError (a ValueError) naming file and line
        from mcsim.traces import TraceError

        if isinstance(err, TraceError):
            raise UserError(str(err)) from None
        raise
    from mcsim.results import write_netcdf

    try:
        write_netcdf(ds, output, force=force)
    except FileExistsError as err:
        raise UserError(str(err)) from None
    if as_json:
        report = summary.summarize(ds)
        report["output"] = str(output)
        click.echo(json.dumps(_finite(report), indent=2, allow_nan=False))
    else:
        click.echo(summary.format_table(ds))
        click.echo(f"wrote {output}")


@main.command()
@_common
def run(**kw):
    """Run SCENARIO as written: prints median and 5-95 % band of each headline metric, writes NetCDF."""
    _execute("run", **kw)


@main.command()
@_common
def compare(**kw):
    """Run the baseline (levers off) and the factory on identical requests and draws, side by side."""
    _execute("compare", **kw)


if __name__ == "__main__":  # pragma: no cover
    main()
