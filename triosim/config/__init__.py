"""Run configuration: the simulation flags, and how they become a (Trace, Platform, Strategy).

One module turns every way of describing a run into the three objects a simulation needs:

* command-line flags (``triosim run``, ``triosim dag``; :func:`add_sim_flags` defines them),
* a configuration file (``--config run.yaml`` or ``.json``, keys spelled like the flags, or the
  ``config`` block of a ``--json`` result), read by :func:`read_config_file`,
* Python arguments: ``configure(case=2, gpus=4, trace_dir="my_trace")``.

``triosim.cli.console`` and ``triosim.sweep`` are thin shells over it: both read the flag table from
here, neither imports the other.
"""

from __future__ import annotations

from .build import (
    BatchSizes,
    check_case,
    configure,
    layers_to_repeat,
    load_recorded_trace,
    load_scaled_trace,
    op_time_options,
    platform_from_args,
    resolve_batches,
    strategy_from_args,
)
from .files import check_config_facts, config_block, parse_mapping_text, read_config_file
from .flags import DEFAULT_WORD, FlagSpec, FlagTable, add_sim_flags, sim_namespace
from .trace_dirs import default_trace_dir, trace_dir_from_flag

__all__ = [
    "DEFAULT_WORD", "BatchSizes", "FlagSpec", "FlagTable", "add_sim_flags", "check_case", "check_config_facts",
    "config_block", "configure", "default_trace_dir", "layers_to_repeat", "load_recorded_trace", "load_scaled_trace",
    "op_time_options", "parse_mapping_text", "platform_from_args", "read_config_file", "resolve_batches",
    "sim_namespace", "strategy_from_args", "trace_dir_from_flag",
]
