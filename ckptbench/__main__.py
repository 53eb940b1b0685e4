from ckptbench.cli import main

main()
