"""Tensor parallelism: mpirun ranks and the layout of a TP run (tp_layout.py), process groups and
their rendezvous (tp_groups.py), each rank's endpoint and lifecycle, and the all-reduce.
"""
