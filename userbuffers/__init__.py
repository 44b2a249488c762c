"""Transformer Engine userbuffer tables of published recipes, shipped with triosim
(``--tp-comm-overlap-cfg NAME`` finds them by name)."""
