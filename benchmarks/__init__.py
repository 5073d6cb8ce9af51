"""Speed, memory and verification benchmarks; benchmarks/README.md lists each suite, its command and its result file
(`python -m benchmarks.run` runs the speed and memory sections: op, train, inference, e2e, kernel, gpu)."""
