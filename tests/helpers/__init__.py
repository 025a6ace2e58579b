"""What several test modules share: builders, fixtures, reference runs, launched ranks, and the order tests run in."""
