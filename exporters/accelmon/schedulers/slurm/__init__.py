"""accelmon's Slurm integration (docs/health.md): the HealthCheckProgram and the diagnostic prolog (`health`), the
repair loop it runs (`repair`), Slurm's view of the nodes (`nodes`), the fleet-wide limits every node's check keeps
through the controller (`fleet`: the circuit breaker, the repair pace, the pause switch) and their command
(`accelmon-remediation`, `remediation_cli`)."""
