"""The ground floor: domain types and the step contract all services share, with their _pb converters."""
