from tokenloom.formats._cli import main

main(prog_name="tokenloom")
