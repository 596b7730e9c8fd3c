"""The command line: one module a command, their shared options, and error reporting. The one
lazy boundary: a command's module imports the library only when the command runs, so
`charlm --help` and config errors never load torch. May import: anything."""
