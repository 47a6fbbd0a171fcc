"""What ``mcsim capacity`` does once click has read its options: bisect the rate, print the capacity."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mcsim.optimize.capacity import capacity
from mcsim.results.capacity_dataset import capacity_summary, format_capacity
from mcsim.scenario import load_scenario
from mcsim.text import safe_filename, strict_json


def capacity_command(*, scenario, samples, requests, seed, overrides, output, force, as_json, workers, processes,
                     scheduler, calibration, no_progress, rtol, low, high, command):
    """Run the capacity search asked on the command line and print its summary."""
    if calibration is not None:
        overrides = (*overrides, f"performance.calibration={json.dumps(str(calibration))}")
    scn = load_scenario(scenario, overrides=overrides)
    output = output or Path("outputs") / f"{safe_filename(scn.name)}-capacity.nc"
    try:
        ds = capacity(scn, samples=samples, requests=requests, seed=seed, rtol=rtol, low=low, high=high,
                      workers=workers, processes=processes, scheduler=scheduler, output=output, force=force,
                      progress=not no_progress and not as_json, command=command)
    except KeyboardInterrupt:
        click.echo("\ninterrupted: nothing written (a capacity search keeps no parts; run it again)", err=True)
        raise SystemExit(130) from None
    if as_json:
        click.echo(json.dumps(strict_json(dict(capacity_summary(ds), output=str(output))), indent=2,
                              allow_nan=False))
    else:
        click.echo(format_capacity(ds))
        click.echo(f"wrote {output}")
