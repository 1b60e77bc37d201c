"""Tools that ship with the repository, not the package: the demo and the workload generator."""
