"""The paper's experiments at Fashion-MNIST scale; each module is one command writing to reports/."""
