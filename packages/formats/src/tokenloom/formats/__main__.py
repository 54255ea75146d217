from tokenloom.formats.cli.group import main

main(prog_name="tokenloom")
