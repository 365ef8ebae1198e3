"""Adapting to the machine: CPU ISA probing, OpenMP waiting and thread binding, huge pages,
free ports."""
