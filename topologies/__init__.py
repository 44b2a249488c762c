"""Cluster topology files shipped with triosim (``--topology-file NAME`` finds them by name)."""
