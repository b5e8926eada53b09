from sbcli.cli.app import main

main()
