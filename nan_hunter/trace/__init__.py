"""Op interception, module tracking, tensor statistics and events."""
