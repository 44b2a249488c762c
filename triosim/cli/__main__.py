"""``python -m triosim.cli``: the console script."""

from .console import console_main

console_main()
