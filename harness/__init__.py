"""What runs the suite's own commands, for the tests, the benchmark and
scripts/cluster_step.py: a launcher under a hard wall-clock bound that leaves
no process behind (launch), and hosts made of network namespaces with real
OpenSSH between them (cluster). Training never imports it."""
