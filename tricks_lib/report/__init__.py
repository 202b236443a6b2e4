"""The main command (``python -m tricks_lib run``) and everything it writes.

A notebook records each measured trick (``results.record``) and closes with a verdict table
(``verdicts.VerdictTable``); ``runner`` executes the notebooks (``notebook_source``: which ones, and whether
their outputs may be stored; ``run_times``: each one's recorded run time) and writes the summary
(``summary``: summary.json and summary.md; ``summary_html``: the page), which ``summary_diff`` compares
between two runs (``python -m tricks_lib diff``).

Nothing is re-exported here: importing one module of the report loads only what it needs.
"""
