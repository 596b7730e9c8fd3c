"""`python -m charlm` runs the command-line interface."""

from charlm.cli import main

if __name__ == "__main__":
    main()
