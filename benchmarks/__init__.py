"""Speed and memory benchmarks; `python -m benchmarks.run` runs them all and writes results.json and RESULTS.md."""
