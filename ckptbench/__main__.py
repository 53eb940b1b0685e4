from ckptbench.cli.main import run

run()
