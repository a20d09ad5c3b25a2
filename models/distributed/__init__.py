"""models/distributed"""
