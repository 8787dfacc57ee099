"""The kernel-optimisation environment: faster implementations of reference functions, graded by a
harness that checks correctness on fresh inputs and times candidate and reference interleaved in a
sandbox, with the known timing exploits detected (see :mod:`relayrl.environments.kernels.harness`)."""
