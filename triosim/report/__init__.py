"""What a run shows: the Result (per-GPU and per-link figures from the TaskGraph and the Schedule,
the JSON document), the rich summary, the Chrome/Perfetto timeline and the DOT picture of the
task DAG (with its collapsing into layers or stages)."""
