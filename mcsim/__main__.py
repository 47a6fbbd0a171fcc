from mcsim.cli import main

main()
