"""The pipeline layout flags, by Megatron-Core's names (``--account-for-embedding-in-pipeline-split``,
``--account-for-loss-in-pipeline-split``, ``--decoder-first-pipeline-num-layers``,
``--decoder-last-pipeline-num-layers``, ``--pipeline-model-parallel-layout``): their argparse
definitions and what they become in a Strategy (:mod:`triosim.graph.pipeline.layer_layout`)."""

from __future__ import annotations

import argparse

from ..graph.pipeline.layer_layout import (
    EMBEDDING_FLAG,
    FIRST_FLAG,
    LAST_FLAG,
    LAYOUT_FLAG,
    LOSS_FLAG,
)

DESTS = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
         "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout")


def add_layout_flags(g: argparse._ArgumentGroup) -> None:
    """Add the layout flags to the ``strategy`` flag group."""
    g.add_argument(EMBEDDING_FLAG, action="store_true",
                   help="layer cuts: count the embedding as one layer in the pipeline split (the first stage gets "
                        "one transformer layer fewer), as Megatron-Core")
    g.add_argument(LOSS_FLAG, action="store_true",
                   help="layer cuts: count the loss (with the output layer) as one layer in the pipeline split (the "
                        "last stage gets one transformer layer fewer), as Megatron-Core")
    g.add_argument(FIRST_FLAG, type=int, default=None, metavar="N",
                   help="layer cuts: N transformer layers on the first pipeline rank, the others share the rest "
                        "equally (Megatron-Core's uneven pipeline)")
    g.add_argument(LAST_FLAG, type=int, default=None, metavar="N",
                   help="layer cuts: N transformer layers on the last pipeline rank")
    g.add_argument(LAYOUT_FLAG, default=None, metavar="LAYOUT",
                   help="layer cuts: every stage's layers in Megatron-Core's syntax, stages in order separated by "
                        "| (E embedding, t transformer layer, m multi-token-prediction layer, L loss; x*n and (...)*n "
                        "repeat), pp x V stages "
                        "(V: the virtual stages), e.g. 'Et|(tt|)*62tL' for 126 layers on --pp 8 × V 8")


def layout_options(args: argparse.Namespace) -> dict:
    """Strategy keyword arguments of the layout flags."""
    return {k: getattr(args, k, None) if k.startswith(("decoder", "pipeline")) else bool(getattr(args, k, False))
            for k in DESTS}


__all__ = ["DESTS", "add_layout_flags", "layout_options"]
