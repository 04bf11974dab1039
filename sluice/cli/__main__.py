from sluice.cli.main import main

main()
