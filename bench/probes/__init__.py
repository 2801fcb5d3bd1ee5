"""Probes: one-off measurements that informed a change (a default, a kernel, a fix), kept so
each can be rerun: `python -m bench.probes.NAME`, its results under bench/results/NAME/.

The headline benchmarks, those the README and docs/benchmarks.md's headline table cite, the
learning benchmarks and the sweeps that chose defaults, are in `bench/`; bench/README.md
says what is where. A probe's table in the docs is the last time it ran, not a claim kept
current.
"""
