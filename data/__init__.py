"""Real traces bundled with pbkv (package data, so an installed wheel has them too).

- ``taubench/gpt-4o-airline.json.gz``: τ-bench's ``historical_trajectories/gpt-4o-airline.json``
  (sierra-research/tau-bench), MIT licence in ``taubench/LICENSE``; 200 episodes of a
  tool-using airline agent talking to a simulated user. Read by
  :class:`pbkv.examples.TauBenchApp`.
- ``mooncake/{conversation,synthetic}_trace.jsonl.gz``: the Mooncake FAST'25 request traces
  (kvcache-ai/Mooncake, ``FAST25-release/traces/``), Apache-2.0 licence in
  ``mooncake/LICENSE``, the upstream notes in ``mooncake/SOURCE_README.md``. Read by
  :func:`pbkv.examples.load_mooncake`.

The files are gzip-compressed copies, byte for byte, of the upstream ones.
"""
