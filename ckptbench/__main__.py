from ckptbench.cli.main import main

main()
