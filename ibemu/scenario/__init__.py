"""ibemu.scenario"""
