"""``python -m batonq``: the batonq command line."""

from batonq.cli import main

main()
