"""The fleet simulator: K simulated gateways x M signals through the real library into one
broker (or cluster), measured at one subscriber (`unskit fleet-sim`)."""

from __future__ import annotations

from unskit.fleet.sim import FleetOptions, FleetReport, run_fleet

__all__ = ["FleetOptions", "FleetReport", "run_fleet"]
