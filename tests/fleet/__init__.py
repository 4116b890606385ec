"""A package, so that the fleet's package-scoped fixtures (conftest.py: agents, workload, Prometheus) stop once
its tests are done instead of loading the machine for the rest of the session."""
