"""Soteria-defended FedAvg with an auditing server, as a Flower app."""
