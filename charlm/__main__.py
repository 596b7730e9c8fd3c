"""`python -m charlm` runs the command-line interface."""

from charlm.cli.app import main

if __name__ == "__main__":
    main()
