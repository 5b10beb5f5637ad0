"""The `inferlb` command: one table of commands (`main.COMMANDS`), one module per command.

Each command module exposes ``register(subparsers)``, which adds its parser and sets its handler;
``main`` builds the parser from the table and calls the chosen handler. Command modules import what
their handler needs when it runs, so ``inferlb --help`` stays cheap.
"""
