"""What ``mcsim search`` does once click has read its options: run the search, print its summary."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mcsim.optimize.api import search
from mcsim.optimize.racing import SearchInterrupted
from mcsim.results.search_report import format_search, search_summary
from mcsim.scenario import load_scenario
from mcsim.text import safe_filename


def search_command(*, scenario, samples, requests, seed, overrides, output, force, resume, as_json, workers,
                   processes, scheduler, calibration, no_progress, space, objective, minimize, constraints,
                   confidence, quantile, first_round, alpha, command):
    """Run the search asked on the command line and print its summary."""
    if calibration is not None:
        overrides = (*overrides, f"performance.calibration={json.dumps(str(calibration))}")
    scn = load_scenario(scenario, overrides=overrides)
    output = output or Path("outputs") / f"{safe_filename(scn.name)}-search.nc"
    try:
        ds = search(scn, space, objective=objective, maximize=not minimize, constraints=constraints,
                    confidence=confidence, quantile=quantile, samples=samples, requests=requests, seed=seed,
                    first_round=first_round, alpha=alpha, workers=workers, output=output, force=force,
                    resume=resume, processes=processes, scheduler=scheduler,
                    progress=not no_progress and not as_json, command=command)
    except SearchInterrupted as err:
        click.echo(f"\n{err}", err=True)
        raise SystemExit(130) from None
    if as_json:
        click.echo(json.dumps(dict(search_summary(ds), output=str(output)), indent=2, allow_nan=False))
    else:
        click.echo(format_search(ds))
        click.echo(f"wrote {output}")
