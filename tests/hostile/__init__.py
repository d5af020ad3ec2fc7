"""The hostile environment catalog (see cases.py)."""
