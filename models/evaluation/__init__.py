"""models/evaluation"""
