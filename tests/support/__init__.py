"""The test harness shared by tests/, bench/ and the Molecule scenarios' preparation: import it as `tests.support`.

- `paths`: the repository's folders.
- `processes`: free loopback ports, a process's CPU time and memory, starting the exporter and waiting for it.
- `fakenvml`: building and driving the fake libnvidia-ml.so.1.
- `exposition`: reading samples, golden files, promtool.
- `ansible`: one local play, a role's template rendered by Ansible, a unit's ExecStart.
- fixture trees and doubles: `infiniband_tree`, `jobs_tree`, `neuron_reports`, `cloudwatch_doubles`,
  `simulated_node` (one whole simulated worker for tests with a real Prometheus).
"""
