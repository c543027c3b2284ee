from profkit.cli import main

if __name__ == "__main__":  # analysis workers are spawned and import this module again
    main()
