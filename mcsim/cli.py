"""The ``mcsim`` command line: a thin layer over :mod:`mcsim.execution.api`.

One error boundary (:class:`Mcsim`, the command group) serves every command:

* an :class:`~mcsim.errors.McsimError` (bad scenario, trace, calibration, measurement, existing output...) or an
  ``OSError`` (a read-only folder, a full disk, an output under a file) is one line on stderr,
  ``error: <file>: <where>: <what>``, and exit code 2;
* Ctrl-C is exit code 130 (a sweep says how to resume it);
* anything else is a bug: one line naming the exception, a hint to rerun with ``--debug`` for the traceback,
  and exit code 1.

Text that came from outside (file contents, server replies) is printed with control characters escaped and cut
to :data:`mcsim.text.MAX_LINE` characters.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shlex
import sys
import warnings
from pathlib import Path

import click

from mcsim.errors import McsimError, OutputError
from mcsim.fileio import atomic_write, not_a_regular_file, refuse_inputs
from mcsim.tables import paragraph, table
from mcsim.text import one_line, safe_filename, strict_json

EXIT_USAGE = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130
def _os_message(err: OSError) -> str:
    where = err.filename if err.filename is not None else ""
    what = err.strerror or str(err)
    return f"{where}: {what}" if where else what


@contextlib.contextmanager
def _warnings_as_lines():
    """Within a command, a warning mcsim issues (an implausible value) becomes one ``warning:`` line on stderr,
    each message once, when the command has done its work: a command that fails prints its one error line alone.
    Other libraries' warnings keep Python's own handling."""
    held: list[str] = []
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        # by name: importing mcsim.scenario here would load NumPy for `mcsim run --help`
        if category.__name__ != "ImplausibleValue" or not category.__module__.startswith("mcsim."):
            return previous(message, category, filename, lineno, file, line)
        text = one_line(message)
        if text not in held:
            held.append(text)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
    for text in held:
        click.echo(f"warning: {text}", err=True)


class Mcsim(click.Group):
    """The command group: every command runs inside one error boundary (see the module docstring)."""

    def invoke(self, ctx):
        debug = bool(ctx.params.get("debug"))
        try:
            with _warnings_as_lines():
                return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort, SystemExit):
            raise
        except (McsimError, OSError) as err:
            if debug:
                raise
            message = err if isinstance(err, McsimError) else _os_message(err)
            click.echo(f"error: {one_line(message)}", err=True)
            raise SystemExit(EXIT_USAGE) from None
        except Exception as err:  # a bug: say so in one line
            if debug:
                raise
            click.echo(f"error: internal error: {type(err).__name__}: {one_line(err)} (this is a bug in mcsim; run "
                       "again with --debug for the traceback)", err=True)
            raise SystemExit(EXIT_BUG) from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            value = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as err:  # usage errors too: one line, with where to read more
            where = ""
            if isinstance(err, click.UsageError) and err.ctx is not None:
                where = f" (see {err.ctx.command_path} --help)"
            # click's layout (a newline and a tab before each choice) becomes spaces; other control characters of a
            # user's value stay escaped
            click.echo(f"error: {one_line(' '.join(err.format_message().split()))}{where}", err=True)
            raise SystemExit(err.exit_code) from None
        except (click.exceptions.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            click.echo("\ninterrupted", err=True)
            raise SystemExit(EXIT_INTERRUPTED) from None
        raise SystemExit(value if isinstance(value, int) else 0)


class _Finite(click.ParamType):
    """A finite number >= 0 (``nan``, ``inf`` and ``1e400`` are refused: FloatRange lets NaN through)."""

    name = "FLOAT"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r}: expected a finite number >= 0", param, ctx)
        return number


FINITE = _Finite()


class _Requests(click.ParamType):
    """Requests per sample: a count >= 1, or ``auto`` / ``auto:N`` (grow until steady, at most N)."""

    name = "N|auto[:N]"

    def convert(self, value, param, ctx):
        text = str(value).strip().lower()
        # ASCII digits only: str.isdigit() is true of '²', which int() refuses
        if re.fullmatch(r"[0-9]+", text) and int(text) >= 1:
            return int(text)
        if text == "auto" or (re.fullmatch(r"auto:[0-9]+", text) and int(text[5:]) >= 1):
            return text
        self.fail(f"{value!r}: expected a count of requests >= 1, 'auto' or 'auto:N'", param, ctx)


REQUESTS = _Requests()


def _refuse_non_regular(output) -> None:
    """A one-line refusal for an output that exists and is not a regular file (``--force`` does not apply)."""
    reason = not_a_regular_file(output)
    if reason:
        raise UserError(f"{output}: {reason}")


class UserError(McsimError, click.ClickException):
    """Bad use of a command; printed as one line by :class:`Mcsim`."""

    exit_code = EXIT_USAGE


#: What each command writes when -o is not given (``<name>``: the scenario's meta.name as a safe file name).
DEFAULT_OUTPUT = {
    "run": "outputs/<name>.nc; outputs/<name>-sweep.nc with --grid",
    "compare": "outputs/<name>-compare.nc; outputs/<name>-compare-ablate.nc with --ablate",
    "sweep": "outputs/<name>-sweep.nc; outputs/<name>-sweep-ablate.nc with --ablate",
    "search": "outputs/<name>-search.nc",
    "capacity": "outputs/<name>-capacity.nc",
}


def _common(command: str, skip=()):
    """The options that run, compare, sweep and search share; ``command`` names the default output in -o's help;
    ``skip`` leaves options out (by their parameter name)."""
    return lambda f: _common_options(f, DEFAULT_OUTPUT[command], skip)


def _common_options(f, default_output: str, skip=()):
    options = [
        click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--samples", type=click.IntRange(min=1), help="Monte Carlo samples (default: [mc] samples)."),
        click.option("--requests", type=REQUESTS,
                     help="Requests per sample (default: [mc] requests); run, compare and sweep take 'auto' (grow from "
                          "mc.requests until every sample is at steady state, at most 16 x) or 'auto:N' (at most N)."),
        click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), help="Root seed (default: [mc] seed)."),
        click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
                     help="Override a scenario value, e.g. --set speculative.draft_tokens=2 (repeatable)."),
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
                     help=f"NetCDF file to write (default: {default_output})."),
        click.option("--force", is_flag=True, help="Overwrite an existing output file and discard leftover parts."),
        click.option("--resume", is_flag=True, help="Finish an interrupted run from its saved parts."),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
        click.option("--workers", type=click.IntRange(min=1), help="Dask threads or processes (default: all cores)."),
        click.option("--processes", is_flag=True, help="Run a local cluster of processes instead of threads."),
        click.option("--scheduler", metavar="ADDRESS",
                     help="Use an existing dask.distributed scheduler, e.g. tcp://127.0.0.1:8786; one that does not "
                          "answer within a few seconds is an error."),
        click.option("--chunk-size", type=click.IntRange(min=1), help="Samples per Dask task."),
        click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path),
                     help="Draw the step-time parameters from a calibration (`mcsim calibrate`, `mcsim trace "
                          "--save-calibration`) per sample; refused if measured in another regime. Sets "
                          "performance.calibration."),
        click.option("--no-progress", is_flag=True, help="Hide the progress bar (it is shown only on a terminal, "
                                                          "for runs longer than two seconds)."),
    ]
    for option in reversed(options):
        if skip and _param_name(option) in skip:
            continue
        f = option(f)
    return f


def _param_name(decorator) -> str:
    """The parameter name of a click option or argument decorator (applied to a throwaway function)."""
    probe = decorator(lambda: None)
    return probe.__click_params__[-1].name


#: Set by :func:`console`: this process is the ``mcsim`` command itself and ends with it.
_STANDALONE = False


def console():
    """The ``mcsim`` console command: :func:`main` in a process of its own (tests drive :func:`main` in theirs)."""
    global _STANDALONE
    _STANDALONE = True
    main()


def _numpy_results_only() -> None:
    """In the ``mcsim`` command's own process only: xarray need not import Dask and Pint to learn that mcsim's
    arrays are NumPy's (:func:`mcsim.results.dataset.numpy_arrays_only`); a test's or a notebook's process is never
    touched."""
    if _STANDALONE:
        # start-up: the results' module imports xarray; `mcsim --help` imports none of it
        from mcsim.results.dataset import numpy_arrays_only

        numpy_arrays_only()


@click.group(cls=Mcsim, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mcsim")
@click.option("--debug", is_flag=True, help="Show the traceback of an internal error instead of one line.")
def main(debug):
    """mcsim: Monte Carlo economics of serving large language models.

    All figures it prints are modelled from the scenario's assumptions, not measured.
    """


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
        elif name == "measurements":
            words += [shlex.quote(str(v)) for v in value]
        elif isinstance(value, (tuple, list)):  # a repeatable option: once per value
            words += [f"--{name.replace('_', '-')} {shlex.quote(str(v))}" for v in value]
        else:
            words.append(f"--{name.replace('_', '-')} {shlex.quote(str(value))}")
    return " ".join(words)


def _execute(kind, scenario, samples, requests, seed, overrides, output, force, resume, as_json, workers,
             processes, scheduler, chunk_size, no_progress, calibration=None, grid=(), ablate=False, lhs=False,
             compare=False):
    # start-up: a run imports NumPy, xarray, Numba and Dask; `mcsim --help` imports none of the commands
    from mcsim.execution import api as runner, executor
    from mcsim.results import summary
    from mcsim.scenario import load_scenario

    if lhs:
        overrides = (*overrides, 'mc.sampling="lhs"')
    if calibration is not None:
        overrides = (*overrides, f"performance.calibration={json.dumps(str(calibration))}")
    try:
        scn = load_scenario(scenario, overrides=overrides)
        _ready_to_run(progress=not no_progress and not as_json)
        suffix = {"compare": "-compare", "sweep": "-sweep"}.get(kind, "")
        output = output or Path("outputs") / f"{safe_filename(scn.name)}{suffix}{'-ablate' if ablate else ''}.nc"
        options = dict(samples=samples, requests=requests, seed=seed, workers=workers, output=output, force=force,
                       progress=not no_progress and not as_json, command=_command_line(), resume=resume,
                       processes=processes, scheduler=scheduler, chunk_size=chunk_size)
        if kind == "sweep":
            variants = ("baseline", "factory") if compare or ablate else ("factory",)
            ds = runner.sweep(scn, grid, variants=variants, ablate=ablate, **options)
        elif kind == "compare":
            ds = runner.compare(scn, ablate=ablate, **options)
        else:
            ds = runner.run(scn, **options)
    except executor.SweepInterrupted as err:  # every other error is the command group's (one line, exit 2)
        click.echo(f"\n{err}", err=True)
        raise SystemExit(130) from None
    if as_json:
        report = summary.summarize(ds)
        report["output"] = str(output)
        if ds.attrs.get("requests_auto"):
            report["requests_auto"] = ds.attrs["requests_auto"]
        if ds.attrs.get("pricing_note"):
            report["pricing_note"] = ds.attrs["pricing_note"]
        click.echo(json.dumps(strict_json(report), indent=2, allow_nan=False))
    else:
        click.echo(summary.format_table(ds))
        if ds.attrs.get("requests_auto"):
            click.echo("\n".join(paragraph(f"--requests auto: {ds.attrs['requests_auto']}.")))
        click.echo(f"wrote {output}")


GRID_HELP = "A grid axis: PATH=v1,v2,... or PATH=START:STOP:NUM[:log] (repeatable; adds to [sweep])."


@main.command()
@_common("run")
@click.option("--grid", multiple=True, metavar="PATH=VALUES", help=GRID_HELP + " Makes the run a sweep.")
def run(**kw):
    """Run SCENARIO as written: prints median and 5-95 % band of each headline metric, writes NetCDF."""
    _execute("sweep" if kw["grid"] else "run", **kw)


@main.command()
@_common("compare")
@click.option("--ablate", is_flag=True,
              help="Also switch each lever off (and on) alone, and attribute the gain to levers (Shapley).")
def compare(**kw):
    """Run SCENARIO's baseline (levers off) and factory on identical requests and draws, side by side."""
    _execute("compare", **kw)


@main.command()
@_common("sweep")
@click.option("--grid", multiple=True, metavar="PATH=VALUES", help=GRID_HELP)
@click.option("--compare", is_flag=True, help="Run baseline and factory at every grid point.")
@click.option("--ablate", is_flag=True, help="Compare with lever ablations and Shapley shares at every grid point.")
@click.option("--lhs", is_flag=True, help="Draw the uncertain inputs by Latin hypercube.")
def sweep(**kw):
    """Run SCENARIO over a grid of parameter values (its [sweep] table and --grid axes) on Dask."""
    _execute("sweep", **kw)


@main.command()
@_common("search", skip=("chunk_size",))
@click.option("--space", multiple=True, required=True, metavar="PATH=VALUES",
              help="A search axis: PATH=v1,v2,... or PATH=START:STOP:NUM[:log], as sweep --grid (repeatable; adds "
                   "to [sweep]). Every grid point is a candidate.")
@click.option("--objective", default="cost_usd_per_mtok", show_default=True, metavar="NAME",
              help="Result variable to optimize (NAME@Q for a per-request quantile, e.g. ttft_s@0.99).")
@click.option("--minimize/--maximize", default=True, show_default=True, help="Direction of the objective.")
@click.option("--constraint", "constraints", multiple=True, metavar="NAME>=VALUE",
              help="A constraint per sample, e.g. \"slo_attainment>=0.99\" (>=, <=, >, <; repeatable); infeasible "
                   "samples fail every constraint.")
@click.option("--confidence", type=click.FloatRange(0, 1, min_open=True), default=0.9, show_default=True,
              help="Share of samples in which a candidate must meet every constraint.")
@click.option("--quantile", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="Quantile over samples of the objective that is optimized (0.5: the median).")
@click.option("--first-round", type=click.IntRange(min=1), default=4, show_default=True,
              help="Samples every candidate runs in the first round; the candidates kept double theirs each round.")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.1, show_default=True,
              help="Level of the racing rule's tests (the risk of dropping a candidate that could still win).")
def search(**kw):
    """The robust optimum of a configuration space of SCENARIO: the candidate whose objective at --quantile over
    samples is best among those meeting every --constraint with probability >= --confidence, found by racing the
    candidates on common random numbers (few samples for all, more for those that could still win). Writes the
    candidates' samples as NetCDF; `mcsim report` on it draws the Pareto fronts and the regret table."""
    # start-up: a search imports NumPy, xarray, SciPy and Dask; `mcsim --help` imports none of the commands
    from mcsim.optimize.command import search_command

    _ready_to_run(progress=not kw.get("no_progress") and not kw.get("as_json"))
    search_command(command=_command_line(), **kw)


@main.command()
@_common("capacity", skip=("resume", "chunk_size"))
@click.option("--rtol", type=click.FloatRange(1e-4, 1), default=0.02, show_default=True,
              help="Relative width of each sample's final bracket: the rate that met the SLOs and the rate that "
                   "broke them differ by at most this (at least 1e-4; at most 40 bisections).")
@click.option("--low", type=click.FloatRange(0, min_open=True), metavar="RPS",
              help="Start the bracket here, requests/s (default: the scenario's rate).")
@click.option("--high", type=click.FloatRange(0, min_open=True), metavar="RPS",
              help="Never try a rate above this, requests/s (the capacity is then at most this).")
def capacity(**kw):
    """The highest arrival rate at which SCENARIO's deployment (its fleet held fixed) meets its SLOs: its
    slo_quantile TTFT and TPOT within their targets, unsaturated. Each sample is bisected on the rate on its own
    common random numbers; prints the median and 5-95 % band over samples and what the deployment does there, and
    writes every sample's runs as NetCDF."""
    # start-up: the search imports NumPy, xarray and Dask; `mcsim --help` imports none of the commands
    from mcsim.optimize.capacity_command import capacity_command

    _ready_to_run(progress=not kw.get("no_progress") and not kw.get("as_json"))
    capacity_command(command=_command_line(), **kw)


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--decode-seqs", type=FINITE, default=1.0, show_default=True,
              help="Decoding sequences in the step, per instance (at most what the pool's memory holds).")
@click.option("--context", type=FINITE, help="KV length of each decoding sequence, tokens "
              "(default: the sample's mean decode context).")
@click.option("--prefill-tokens", type=FINITE, default=0.0, show_default=True,
              help="Prompt tokens computed in the same step.")
@click.option("--prefill-context", type=FINITE,
              help="Mean earlier tokens a prefill token attends to (default: the sample's mean).")
@click.option("--pool", type=click.Choice(["decode", "prefill"]), default="decode", show_default=True,
              help="The pool whose instance runs the step (prefill: a disaggregated prefill instance).")
@click.option("--sample", type=click.IntRange(min=0), default=0, show_default=True,
              help="Which Monte Carlo sample's draws to use.")
@click.option("--baseline", is_flag=True, help="The baseline variant (levers off) instead of the factory.")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE", help="Override a scenario value.")
@click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw the step-time parameters from a calibration file (sets performance.calibration).")
@click.option("--json", "as_json", is_flag=True, help="Print the step as JSON.")
def steps(scenario, decode_seqs, context, prefill_tokens, prefill_context, pool, sample, baseline, overrides,
          calibration, as_json):
    """One step of one instance of SCENARIO, op by op (time, FLOPs, bytes, what bounds it), and each pool's memory."""
    # start-up: the step model imports NumPy, SciPy and xarray; `mcsim --help` imports none of the commands
    from mcsim.execution import api

    if prefill_tokens == 0 and decode_seqs == 0:
        raise UserError("a step needs --decode-seqs or --prefill-tokens above 0")
    if calibration is not None:
        overrides = (*overrides, f"performance.calibration={json.dumps(str(calibration))}")
    step = api.step_time(scenario, decode_seqs=decode_seqs, context=context, prefill_tokens=prefill_tokens,
                         prefill_context=prefill_context, pool=pool, sample=sample,
                         variant="baseline" if baseline else "factory", overrides=overrides)
    fits = step["memory"].get(pool, {}).get("max_sequences")
    if fits is not None and decode_seqs > fits:
        raise UserError(f"--decode-seqs {decode_seqs:g}: only {fits:,} sequences of this context fit in a {pool} "
                        "instance's KV memory; price at most that many (or a shorter --context)")
    if as_json:
        click.echo(json.dumps(strict_json(step), indent=2, allow_nan=False))
        return
    click.echo("\n".join(paragraph(
        f"{step['scenario']}, sample {step['sample']}, {step['variant']}, {step['fidelity']} fidelity, "
        + (f"{step['stack']} stack, " if step.get("stack") else "") +
        f"{step['pool']} pool ({step['gpus_per_instance']} GPUs per instance); every figure is modelled.")))
    click.echo("\n".join(paragraph(
        f"step: {step['decode_seqs']:g} decoding sequences x {step['verify_tokens']} tokens at "
        f"{step['decode_context']:,.0f} tokens of context, {step['prefill_tokens']:g} prefill tokens "
        f"-> {1e3 * step['step_s']:.4g} ms")))
    rows = [[name, f"{1e3 * op['t_s']:.4g}", f"{100 * op['share']:.1f} %",
             f"{1e3 * op['floor_s']:.4g}" if math.isfinite(op["floor_s"]) else "-", _quantity(op["flops"], "FLOP"),
             _quantity(op["bytes"], "B"), op["bound"]]
            for name, op in step["ops"].items() if op["t_s"] > 0]
    click.echo(_text_table(["op (per GPU)", "ms", "share", "of which kernel floors, ms", "FLOPs", "bytes",
                            "bound by"], rows))
    ran = {name: op["implementation"] for name, op in step["ops"].items() if op.get("implementation")}
    for name, implementation in ran.items():
        click.echo(f"{name} ran as: {implementation}")
    hidden = {name: op["hidden_s"] for name, op in step["ops"].items() if op.get("hidden_s", 0) > 0}
    if hidden:
        each = ", ".join(f"{name} {1e3 * s:.4g} of {1e3 * (s + step['ops'][name]['t_s']):.4g} ms" for name, s in
                         hidden.items())
        full = sum(hidden.values()) >= step["compute_s"] * (1 - 1e-9)
        click.echo("\n".join(paragraph(
            f"hidden behind compute: {each} (two micro-batches, each communicating while the other computes; "
            f"the step computes {1e3 * step['compute_s']:.4g} ms"
            + (", all of it hiding communication: no more can hide)" if full else ")"))))
    click.echo("")
    mem_rows = [[pool_name, f"{m['weights_gb_per_gpu']:.2f}", f"{m['kv_gb_per_sequence'] * 1e3:.2f}",
                 f"{m['free_kv_gb']:.2f}", f"{m['max_sequences']:,}", m["reason"]]
                for pool_name, m in step["memory"].items()]
    click.echo(_text_table(["memory per pool", "weights GB/GPU", "KV MB/sequence/GPU", "free KV GB/GPU",
                            "sequences/instance", "fits"], mem_rows))


def _quantity(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _text_table(header, rows) -> str:
    return "\n".join(table([header, *rows]))


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the report (default: RESULTS without .nc, plus -report).")
@click.option("--force", is_flag=True, help="Replace an existing report folder.")
@click.option("--metrics", help="Comma-separated variables to report instead of the headline ones.")
@click.option("--at", "at", multiple=True, metavar="PATH=VALUE",
              help="Grid value the figures focus on, e.g. --at hardware.preset=h200 (repeatable; "
                   "--at variant=NAME for a variant). Default: the first value of each grid axis.")
def report(results, out_dir, force, metrics, at):
    """Quantiles, sensitivities, figures and a Markdown summary of RESULTS (a NetCDF file of run, compare or
    sweep)."""
    # start-up: a report imports xarray and matplotlib; `mcsim --help` imports none of the commands
    from mcsim.results.report import ReportError, write_report

    _numpy_results_only()

    out_dir = out_dir or results.with_name(results.stem + "-report")
    focus = {}
    for item in at:
        path, sep, value = item.partition("=")
        if not sep or not path.strip() or not value.strip():
            raise UserError(f"--at {item}: expected PATH=VALUE, e.g. --at hardware.preset=h200")
        focus[path.strip()] = value.strip()
    chosen = [m.strip() for m in metrics.split(",") if m.strip()] if metrics is not None else None
    try:
        summary_path = write_report(results, out_dir, metrics=chosen, overwrite=force, at=focus)
    except (FileExistsError, ReportError, OutputError):
        raise  # the command group's one line
    except (OSError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "did not find a match" in first or "Unknown file format" in first:
            first = "not a NetCDF result file of mcsim"
        raise UserError(f"{results}: {first}") from None
    click.echo(f"wrote {summary_path}")


@main.command()
@click.option("--model", default="llama-3.1-8b", show_default=True, help="Model catalog entry (scaled to fit).")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="Prompt length of the traced request (seeded random token ids), one prefill pass.")
@click.option("--decode-tokens", type=click.IntRange(min=1), default=16, show_default=True,
              help="Decode steps traced after the prefill, one token each.")
@click.option("--max-params", type=click.FloatRange(min=1e4), default=2e8, show_default=True,
              help="Parameter budget of the scaled decoder.")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
              help="NumPy dtype of the decoder's weights and matmuls (float16 is calibrated as a 16-bit, bf16, "
                   "regime; NumPy's float16 matmuls do not use BLAS).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the weights, the prompt, the sampled tokens and the calibration's bootstrap.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for trace.jsonl, summary.json and report.md (default: outputs/trace-<model>).")
@click.option("--force", is_flag=True, help="Overwrite existing outputs.")
@click.option("--bench-seconds", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Time for the micro-benchmarks of this machine's GEMM FLOP/s and memory bandwidth.")
@click.option("--ollama", "ollama_url", metavar="URL", help="Also measure a local model served by Ollama.")
@click.option("--ollama-model", metavar="NAME", help="The Ollama model to measure (with --ollama).")
@click.option("--ollama-runs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Generate calls to Ollama; its speeds are token-weighted means over them.")
@click.option("--ollama-timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds one Ollama call may take in all (connection, generation, reply); a server that does "
                   "not answer in time skips the Ollama measurement with a warning.")
@click.option("--ollama-weights-gb", type=click.FloatRange(min=0, min_open=True),
              help="Size of the Ollama model's weights, GB (as `ollama list` shows): makes the Ollama measurement a "
                   "data point of the calibration's bandwidth fraction.")
@click.option("--save-calibration", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a calibration (TOML) for scenarios of this machine (hardware.preset = \"cpu-host\").")
def trace(model, prompt_tokens, decode_tokens, max_params, dtype, seed, out_dir, force, bench_seconds, ollama_url,
          ollama_model, ollama_runs, ollama_timeout, ollama_weights_gb, save_calibration):
    """Run a real decoder in NumPy, record every op, price it on hardware profiles and calibrate.

    Wall times and this machine's peaks are measured here; every other latency is a synthetic estimate.
    """
    # start-up: the trace imports NumPy and the scenario catalog; `mcsim --help` imports none of the commands
    from mcsim.optrace.command import trace_and_calibrate

    if bool(ollama_url) != bool(ollama_model):
        raise click.BadParameter("--ollama and --ollama-model go together", param_hint="--ollama-model")
    out_dir = out_dir or Path("outputs") / f"trace-{model}"
    result = trace_and_calibrate(
        model=model, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens, max_params=max_params,
        dtype=dtype, seed=seed, out_dir=out_dir, overwrite=force, bench_seconds=bench_seconds,
        ollama_url=ollama_url, ollama_model=ollama_model, ollama_runs=ollama_runs,
        ollama_timeout_s=ollama_timeout, ollama_weights_gb=ollama_weights_gb, save_calibration=save_calibration,
        warn=lambda msg: click.echo(one_line(msg), err=True))
    cal, this = result["calibration"], result["this_machine"]
    click.echo(f"this machine (measured): {this.peak_flops / 1e9:,.0f} GFLOP/s GEMM, "
               f"{this.bandwidth_bytes_s / 1e9:,.1f} GB/s memory")
    click.echo(f"NumPy decoder (measured): {cal['measured']['decode_tok_s']:,.1f} decode tokens/s; roofline estimate "
               f"for this machine (synthetic): {cal['estimated']['decode_tok_s']:,.1f}; calibration factor "
               f"{cal['calibration_factor']:.3g}; decode is {cal['bottleneck']}-bound")
    if result["ollama"] is not None:
        click.echo(f"Ollama {result['ollama']['model']} (measured): {result['ollama']['decode_tok_s']:,.1f} "
                   "decode tokens/s")
    for name, path in result["paths"].items():
        click.echo(f"wrote {path}")


@main.command()
@click.argument("measurements", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--hardware", metavar="NAME", help="Hardware preset measured (default: from the files' folders, e.g. "
                                                 "h100_dgx, or the step CSV's hardware column).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp8", "fp4"]), default="bf16", show_default=True,
              help="Matmul format the measurements ran (Vidur's profiles: 16-bit).")
@click.option("--stack", default="", help="Serving stack measured, e.g. vllm (recorded in the regime).")
@click.option("--stack-version", default="", help="Its version (recorded in the regime).")
@click.option("--replicates", type=click.IntRange(min=2, max=100_000), default=200, show_default=True,
              help="Bootstrap replicates (resamples of the measured shapes).")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True,
              help="Seed of the bootstrap.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Calibration file to write (TOML).")
@click.option("--force", is_flag=True, help="Replace an existing calibration file.")
@click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON.")
def calibrate(measurements, hardware, dtype, stack, stack_version, replicates, seed, output, force, as_json):
    """Fit the step model's free parameters to measured times, with bootstrap intervals.

    MEASUREMENTS are Vidur profiling CSVs (mlp.csv, all_reduce.csv, send_recv.csv) and step CSVs (columns
    hardware, model, tp, decode_seqs, mean_context, prefill_tokens, time_ms; see docs/CALIBRATION.md). Prints each
    op class's fit and leave-one-shape-out cross-validated error, and writes the calibration a scenario uses with
    `[performance] calibration = FILE` or `--calibration FILE`.
    """
    # start-up: the fits import NumPy, SciPy and the roofline; `mcsim --help` imports none of the commands
    from mcsim.calibration import command as fitting, files

    _refuse_non_regular(output)
    refuse_inputs(output, measurements, "the calibration")
    if output.exists() and not force:
        raise UserError(f"{output}: exists; pass --force to replace it")
    cal, _ = fitting.calibrate(list(measurements), hardware=hardware, dtype=dtype, stack=stack,
                       stack_version=stack_version, replicates=replicates, seed=seed, command=_command_line())
    files.save(cal, output, overwrite=force)
    if as_json:
        click.echo(json.dumps(strict_json(dict(cal.summary(), output=str(output))), indent=2, allow_nan=False))
    else:
        click.echo(fitting.report(cal))
        click.echo(f"wrote {output}")


@main.command("list")
@click.argument("what", type=click.Choice(["presets", "models", "hardware", "keys"]))
@click.argument("section", required=False)
@click.option("--describe", is_flag=True, help="With keys: each key's description under its facts.")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON (every catalog field; every fact of a "
                                                      "key).")
def list_(what, section, describe, as_json):
    """List the catalog presets, the bundled scenarios or the scenario keys.

    \b
    WHAT is one of
      models    every model preset: parameters, layers, attention, experts, context
      hardware  every accelerator preset: HBM, bandwidth, peak FLOP/s, power, prices
      presets   both, and the bundled scenarios (scenarios/*.toml)
      keys      every scenario key, or those of SECTION (e.g. cache): type, default,
                allowed values, whether it takes a distribution, the fidelity that reads it
    """
    # start-up: the listings read the catalog and schema (NumPy, SciPy); `mcsim --help` imports none of the commands
    from mcsim import listing

    if section is not None and what != "keys":
        raise click.BadParameter(f"only 'keys' takes a SECTION, got {section!r}", param_hint="SECTION")
    if what == "keys":
        rows = listing.keys(section)
        if as_json:
            return click.echo(json.dumps(strict_json(rows), indent=2, allow_nan=False))
        return click.echo("\n".join(listing.format_keys(rows, describe=describe)))
    found = {"models": listing.models, "hardware": listing.hardware}
    if as_json:
        out = {w: f() for w, f in found.items()} if what == "presets" else found[what]()
        if what == "presets":
            out["scenarios"] = listing.scenarios()
        return click.echo(json.dumps(strict_json(out), indent=2, allow_nan=False))
    blocks = {"models": listing.format_models, "hardware": listing.format_hardware}
    lines = blocks[what]() if what != "presets" else [
        *blocks["models"](), "", *blocks["hardware"](), "", *listing.format_scenarios()]
    lines += [""] + paragraph("Datasheet and published figures; prices and rental rates are estimates (the sources "
                              "are in mcsim/data/*.toml, or --json).") if what != "models" else []
    click.echo("\n".join(lines))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="JSON (the only format; the flag is accepted for scripts).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the schema to this file instead of printing it.")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
def schema(as_json, output, force):
    """The JSON Schema (draft 2020-12) of scenario files, generated from mcsim's schema.

    Editors and tools can check scenario files (TOML read as JSON) against it. Rules across keys (tp x pp divides
    gpus_per_instance, EPLB's layout) are checked only when mcsim loads a scenario.
    """
    # start-up: the JSON Schema imports the scenario package (NumPy, SciPy)
    from mcsim.scenario.json_schema import scenario_schema

    text = json.dumps(scenario_schema(), indent=2) + "\n"
    if output is None:
        return click.echo(text, nl=False)
    _refuse_non_regular(output)
    if output.exists() and not force:
        raise UserError(f"{output}: exists; pass --force to replace it")
    if not output.parent.is_dir():
        raise UserError(f"{output}: no such folder {output.parent}")
    atomic_write(output, text)
    click.echo(f"wrote {output}")


@main.command()
@click.option("--quick", is_flag=True, help="Small inputs and single repeats: about a minute on an idle "
                                           "2-core machine, longer when other work shares the cores.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for bench.json and scaling.png (default: outputs/bench).")
@click.option("--compile", "compile_only", is_flag=True,
              help="Only compile every kernel a run needs into Numba's on-disk cache (once per machine and "
                   "version; a run does it by itself the first time, with a notice) and say how long it took.")
def bench(quick, as_json, out_dir, compile_only):
    """Benchmark every kernel against its references, one sample end to end, and sweep scaling (as ratios)."""
    if compile_only:
        _compile_kernels(progress=True, always=True)
        return
    # start-up: the benchmarks import every kernel and Dask; `mcsim --help` imports none of the commands
    from mcsim.bench.run import bench_command

    bench_command(quick, as_json, out_dir)


def _ready_to_run(progress: bool) -> None:
    """What a command that simulates does first in its own process: xarray told its arrays are NumPy's, and the
    kernels compiled from cold with a notice (:func:`_numpy_results_only`, :func:`_compile_kernels`)."""
    _numpy_results_only()
    _compile_kernels(progress)


def _compile_kernels(progress: bool, always: bool = False) -> None:
    """Compile every kernel a run needs when this machine has not yet (:mod:`mcsim.execution.precompile`), with a
    one-line notice and a progress bar on a terminal; ``always`` compiles (or loads) whatever the stamp says."""
    if not always and not _STANDALONE:
        return  # a test's or a notebook's process compiles at first use, as Numba does
    # start-up: compiling imports every stage and Numba; `mcsim --help` imports none of it
    from mcsim.execution import precompile

    if not always and precompile.is_compiled():
        return
    if not precompile.cache_on():
        click.echo("mcsim: MCSIM_NUMBA_CACHE=0: nothing is kept, every process compiles its own kernels", err=True)
    else:
        click.echo("mcsim: compiling the kernels for this machine, once per version (a minute or two from cold; "
                   "`mcsim bench --compile` does it ahead of time)", err=True)
    times = precompile.compile_all(bar=progress and sys.stderr.isatty())
    if always:
        click.echo(f"compiled or loaded every kernel in {times['total_s']:.1f} s: "
                   + ", ".join(f"{what} {s:.1f} s" for what, s in times["seconds"].items()))


@main.command()
@click.option("--quick", is_flag=True, help="Smaller samples (wider tolerances from their standard errors).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for validation.md and validation.json (default: outputs/validation).")
def validate(quick, as_json, out_dir):
    """Check the model against closed forms, published figures and real traces; exit 1 if any check fails."""
    # start-up: the checks import every stage and kernel; `mcsim --help` imports none of the commands
    from mcsim.validate import validate_command

    raise SystemExit(validate_command(out_dir, as_json, quick=quick))


if __name__ == "__main__":  # pragma: no cover
    main()
