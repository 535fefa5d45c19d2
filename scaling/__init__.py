"""How many hosts: a model of one data-parallel training step (model.py), its measured inputs
(probe.py, measure.py), the named links (links.py), how_many_hosts.py's table and plot (cli.py,
report.py) and the model against measured steps (validation.py). docs/how_many_hosts.md."""
