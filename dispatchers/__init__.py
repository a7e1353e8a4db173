"""The dispatcher runtime: claims leased outbox messages and delivers them over HTTP."""
