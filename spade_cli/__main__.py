from spade_cli.app import main

main()
