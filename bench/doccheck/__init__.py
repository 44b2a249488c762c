"""Docs that are tested: every number and output block the docs show from a run, tied to the run.

A *claim* is a piece of README.md or docs/*.md that a command produces: a ```console block
(``$ triosim ...`` and what it prints), an output block or a region of a page after a
``<!-- doc-check: COMMAND -->`` comment, numbers in the following paragraph or table
(``<!-- doc-check: COMMAND => VALUE -->``), or cells of a table (``<!-- doc-table: ... -->``).
``bench/check_docs.py`` runs the commands, compares, reports each drift and rewrites the docs
with ``--update``. docs/writing-docs.md is the writer's guide to the syntax.

Modules: ``numbers`` (number tokens, formatting as a doc writes them, values out of a run),
``markdown`` (fences, tables, comments), ``text`` (an output block against a fresh output),
``claims`` and ``tables`` (the claim kinds: what they check and how they rewrite), ``runner``
(running commands in a sandbox), ``checker`` (finding, checking and updating the claims of a
set of pages).
"""
