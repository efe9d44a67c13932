"""ibemu.traffic"""
