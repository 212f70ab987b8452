"""Runtime: launching, queues and events, scheduling, work stealing."""
