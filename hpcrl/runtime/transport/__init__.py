"""How roles talk: Protocols for counters, mailbox, weight board, reports, fragments and group reduce,
with the MPI implementations (RMA windows, channels, links) and the in-memory twins (``local``) side by side."""
