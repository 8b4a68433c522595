from rewrite.cli.process import run

run()
