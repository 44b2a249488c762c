"""``triosim models``: the shipped model cards as a table (or ``--json``), and a user's card
checked and shown (``--model-file FILE``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from ..trace.model_card import ModelCard, read_card_file, shipped_cards


def register(sub: Any) -> None:
    p = sub.add_parser("models", help="list the model cards --model knows, or check a card file")
    p.add_argument("--model-file", metavar="FILE.yaml", default=None,
                   help="check and show your own model card (the fields of docs/models.md) instead")
    p.add_argument("--json", action="store_true", help="print the cards as JSON")
    p.set_defaults(func=cmd_models)
    p.absent_flags = {"--model": "`triosim models` takes no --model: it lists every model card with its shapes "
                                 "(`triosim models --json`: every field and its source); --model NAME is a flag of "
                                 "run, dag, sweep and plan"}


def card_record(c: ModelCard) -> dict[str, Any]:
    """One card, JSON-ready, with the parameter count its shapes imply."""
    return {
        "name": c.name, "description": c.description, "layers": c.layers, "hidden": c.hidden, "heads": c.heads,
        "kv_heads": c.kv_heads, "ffn": c.ffn, "vocab": c.vocab, "seq_len": c.seq_len, "activation": c.activation,
        "norm": c.norm, "bias": c.bias, "dropout": c.dropout, "tied_embeddings": c.tied_embeddings,
        "attention": c.attention, "position": c.position, "parameters": c.parameter_count(),
        "active_parameters": c.active_parameter_count(), "published_params": c.published_params,
        "published_active_params": c.published_active_params, "head_dim": c.head_dim,
        "moe": asdict(c.moe) if c.moe else None, "mla": asdict(c.mla) if c.mla else None,
        "sliding_window": asdict(c.sliding_window) if c.sliding_window else None,
        "mtp_layers": c.mtp_layers, "mtp_parameters": c.mtp_parameter_count(),
        "sources": dict(c.sources), "file": c.path,
    }


def _experts(c: ModelCard) -> str:
    """``128 top 8`` (+ shared experts); ``-`` for a dense model."""
    if c.moe is None:
        return "-"
    shared = f" +{c.moe.shared_experts}" if c.moe.shared_experts else ""
    return f"{c.moe.experts}{shared} top {c.moe.top_k}"


def _attention(c: ModelCard) -> str:
    kind = "mla" if c.mla else "swa" if c.sliding_window else "gqa" if c.kv_heads < c.heads else "mha"
    return f"{kind} {c.attention}"


def card_table(cards: list[ModelCard], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False,
                  caption="params: from the card's shapes (B = 10^9); active: what one token goes through "
                          "(top-k of the routed experts); kv: key/value heads (fewer than heads: grouped-query "
                          "attention); experts: routed (+shared) and top-k; attention: mha, gqa, mla (latent), "
                          "swa (sliding window). Every number's public source is in the card file "
                          "(--json shows them).", caption_justify="left")
    table.add_column("name", no_wrap=True)
    for col in ("layers", "hidden", "heads", "kv", "ffn", "vocab", "seq"):
        table.add_column(col, justify="right")
    table.add_column("mlp / norm / attention", no_wrap=True)
    table.add_column("experts", no_wrap=True)
    table.add_column("params B", justify="right")
    table.add_column("active B", justify="right")
    for c in cards:
        table.add_row(c.name, str(c.layers), f"{c.hidden:,}", str(c.heads), str(c.kv_heads), f"{c.ffn:,}",
                      f"{c.vocab:,}", f"{c.seq_len:,}", f"{c.activation} / {c.norm} / {_attention(c)}",
                      _experts(c), f"{c.parameter_count() / 1e9:,.2f}", f"{c.active_parameter_count() / 1e9:,.2f}")
    return table


def cmd_models(args: argparse.Namespace) -> int:
    if args.model_file is not None:
        cards = [read_card_file(args.model_file)]
        title = f"{args.model_file}: a valid model card"
    else:
        cards = sorted(shipped_cards().values(), key=lambda c: (c.parameter_count(), c.name))
        title = f"{len(cards)} model cards (--model NAME; --model-file FILE.yaml for your own)"
    if args.json:
        sys.stdout.write(json.dumps([card_record(c) for c in cards], indent=2) + "\n")
        return 0
    console = Console(highlight=False)
    if not console.is_terminal:  # a pipe or file: room for every column
        console = Console(highlight=False, width=max(console.width, 172))
    console.print(card_table(cards, title))
    return 0
