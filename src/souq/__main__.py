from souq.client.cli import main

main()
