import streamlit as st

st.title("serve")
