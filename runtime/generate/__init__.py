"""The generate command: its arguments and report (generate_cli.py, generate_report.py), its setup,
opening an engine with the one capture sequence (session.py) and tuning the schedule at start.
"""
