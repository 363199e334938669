"""Front doors into other frameworks, built from repro's own workers (one implementation each).

``verl``: the DeepSpeed engine that verl's trainer loads through its ``verl.plugins`` entry point.
May import anything in repro; nothing in repro imports it, and it is the only place that
imports verl (installed only with ``pip install 'repro[verl]'``).
"""
